"""The examples' models and data, shipped with the package (nothing is downloaded): ``models`` (a digits CNN and
MLP), ``data`` (the UCI digits geomx ships, split per worker), ``charlm`` (a character transformer on the standard
library's own text)."""
