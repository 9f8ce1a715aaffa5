"""Infrastructure that training, the evals and the analysis all use: the judge client (`infra.llm`), the
MLflow tracking conventions (`infra.tracking`), the checkpoint layout readers need
(`infra.checkpoint.layout`), model resolution (`infra.models`), the one redaction (`infra.redact`), the C allocator
(`infra.allocator`) and how entry points end their process (`infra.process_exit`).

It sits below data_prep and train (tests/test_layering.py): it imports nothing of the project but itself,
so an eval finds these where both sides use them instead of reaching into train/."""
