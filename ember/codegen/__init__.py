"""Stage package codegen (see docs/design/001-stage-contracts.md)."""
