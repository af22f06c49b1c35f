"""DGT: differential gradient transmission; the least important slices of a push go over lossy UDP."""
