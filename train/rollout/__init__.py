"""Rollout engines: vLLM (default) and HF generate, behind one interface (`base.RolloutEngine`)."""
