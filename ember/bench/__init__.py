"""ember bench: model suites and the seed experiments."""
