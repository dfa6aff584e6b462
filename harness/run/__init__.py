"""The sweep: cells -> samples -> records (:mod:`.runner`), the run directory's files, lock and record digests
(:mod:`.rundir`), records -> tables (:mod:`.tables`), sharding across ranks (:mod:`.distributed`) and the
terminal's tables and progress bar (:mod:`.console`)."""
