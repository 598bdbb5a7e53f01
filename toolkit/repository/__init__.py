"""The Triton model repository: the contract of its five models, their configs, and the writer."""
