"""The trainer's command line: the `llmtrain` verbs it implements (`local`, `prepare`, `export`,
`scale-test`) and the torchx component. The training runtime (`python -m llmtrain_trainer`,
`llmtrain_trainer.launch`) imports nothing here."""
