"""The reviewer's tools: the rendered spec, its clause coverage, and pictures of a run."""
