"""Evaluation tasks (passkey, ppl, ...) and the task registry."""
