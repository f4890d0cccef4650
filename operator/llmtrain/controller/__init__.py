"""The llmtrain operator (kopf): owns LLMTrainingJobs and the child objects they render to
(PyTorchJobs, JobSets: llmtrain.backends)."""
