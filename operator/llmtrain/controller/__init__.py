"""The llmtrain operator (kopf): owns LLMTrainingJobs and the PyTorchJobs they render to."""
