"""Stage package schedule (see docs/design/001-stage-contracts.md)."""
