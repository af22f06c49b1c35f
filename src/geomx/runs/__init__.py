"""Run files and reports: ``runlog`` (metrics and stats files in a run folder), ``report`` (``geomx report``:
plots and tables of runs), ``checkpoint`` (a global server's checkpoint files), ``progress`` (progress lines of
training scripts), ``summary`` (a job's byte totals and last metrics, from its run folder), ``findings`` (what
servers found out about who stopped a job: the summary names that process)."""
