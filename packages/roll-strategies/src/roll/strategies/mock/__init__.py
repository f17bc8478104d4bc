"""mock_infer: a deterministic fake generation backend for fast pipeline tests (not a model)."""
