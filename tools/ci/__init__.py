"""What `./tools/dev test` (CI's command) loads into its test runs."""
