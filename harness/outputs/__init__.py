"""What a person reads: every figure (:mod:`.plots`: the run's, drawn from its table by the kinds the tasks declare
and the names the derived steps ask for, and the report's; :func:`.plots.write_run_outputs` writes a run's tables
then its figures), the extrapolation report (:mod:`.report`, which lays out plots' figures) and the baseline gate
(:mod:`.compare`)."""
