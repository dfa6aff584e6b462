"""Runner, model adapter, training, result tables and plots of lctx."""
