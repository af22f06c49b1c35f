"""How pytest-xdist deals the suite out (``make test``: ``-n 2 --dist loadscope``), in the one place its controller
reads (it collects nothing, so ``tests/integration/conftest.py`` is not loaded there).

``--dist loadscope`` gives each worker whole modules, so a module's fixtures run once. A session fixture, though,
runs once per worker whose modules use it: ``standard_hips_job`` (a job of 2 parties x 2 workers), used by four
modules, ran on both workers. The modules that use tests/integration/conftest.py's session jobs are one scope here,
so each of those jobs runs once.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import pytest

# The modules that use tests/integration/conftest.py's session jobs (standard_hips_job, standard_flat_job, p3_job):
# one xdist scope. A module that starts using them belongs here (left out, it only costs those jobs once more).
SHARED_JOB_MODULES = frozenset({"test_fsa_equivalence.py", "test_multigps.py", "test_ssp.py",
                                "test_torch_frontend.py", "test_wan_bytes.py"})
SHARED_JOB_SCOPE = "tests/integration::standard-jobs"


# optionalhook: with ``-p no:xdist`` (or -n0 without the plugin) pytest does not know the hook and would refuse it
@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedJobScopes(LoadScopeScheduling):
        """loadscope, with the modules of SHARED_JOB_MODULES one scope."""

        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            path = PurePosixPath(scope)
            if path.parent.name == "integration" and path.name in SHARED_JOB_MODULES:
                return SHARED_JOB_SCOPE
            return scope

    return SharedJobScopes(config, log)
