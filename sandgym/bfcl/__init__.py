"""BFCL v4 (the Berkeley Function Calling Leaderboard) as sandgym environments.

Nothing of BFCL is copied here: its data, checkers and multi-turn backends come from the
`bfcl-eval` package, pinned to one version on the host (installed with --no-deps: data
loading and tool conversion need only the package itself and tree-sitter) and in the
`sandgym/bfcl` sandbox image (with everything its checkers import).

- data: categories, entries, ground truth and OpenAI tool schemas, exactly as BFCL's own
  inference pipeline prepares them for a function-calling model.
- oracle: ground truth turned back into tool calls.
- sandbox_code: the Python that runs inside sandgym/bfcl sandboxes (the stateful backends
  of a rollout, the single-turn scorer, the multi-turn checker).
- export: sandgym results as BFCL result files, and `bfcl evaluate` run on them.
"""
