"""The model executor: the runner, the model, its op implementations and attention backends."""
