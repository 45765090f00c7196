"""Inference backends (the rollout plane's engines): ``hf`` (transformers, the CPU default) and, later,
vLLM and SGLang. Each implements ``echo2sdk.core.interfaces.InferenceBackend`` and registers under the
``echo2sdk.backends`` entry-point group; nothing heavy is imported here."""
