"""Harbor-RL's command line (`harbor`), and the applications built from the other packages: the
`harbor train` pipeline (`train_pipeline`: embedded engine and server, warm-up, GRPO, evaluations) and
launching on Hugging Face Jobs (`jobs`). It sits on top: nothing else imports it."""
