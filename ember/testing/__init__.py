"""Test support for ember (conformance harnesses, reports). Not imported by the pipeline."""
