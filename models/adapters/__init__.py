"""Model adapters: a checkpoint loaded and run for the tasks. :mod:`.hf` is the in-process torch / Hugging Face
adapter (lctx checkpoints, Hugging Face folders, GGUF files through :mod:`.gguf`, llama2.c exports once
converted), with its devices (:mod:`.devices`), attention overrides (:mod:`.overrides`) and memory plan
(:mod:`.memory`, ``lctx plan``)."""
