"""Stage package runtime (see docs/design/001-stage-contracts.md)."""
