"""``python -m geomx.bench.wan``: some rows of the WAN section (see ``geomx.bench.wan.section.main``)."""

from .section import main

raise SystemExit(main())
