"""Harbor-RL's command line. The packages it drives: capture_proxy, harbor_server, harnesses, trainer."""
