"""Model adapters: a model run for the tasks. :mod:`.protocol` says what an adapter is (:class:`.protocol.ModelAdapter`:
the only surface tasks and the runner use; a new backend, e.g. an OpenAI-compatible server, is a new module here
implementing it). :mod:`.hf` is the in-process torch / Hugging Face adapter (:class:`.hf.HFAdapter`: lctx
checkpoints, Hugging Face folders, GGUF files through :mod:`.gguf`, llama2.c exports once converted), with its
devices (:mod:`.devices`), attention overrides (:mod:`.overrides`) and memory plan (:mod:`.memory`, ``lctx plan``)."""
