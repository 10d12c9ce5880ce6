"""``python -m memo_exec`` (what ``torchrun ... -m memo_exec run plan.json`` starts on every rank)."""

from memo_exec.cli import main

main()
