"""`omnistage zoo`: lists the zoo models and refuses an unknown one. (`omnistage serve` with no
model, the demo, is checked by tests/docs/test_examples.py on the docs' own server.)"""

from pathlib import Path


def test_zoo_cli_lists_and_rejects_unknown(capsys):
    from omnistage.entrypoints.cli import main

    assert main(["zoo", "list"]) == 0
    assert "z-image" in capsys.readouterr().out
    assert main(["zoo", "build", "no-such-model", "/tmp/x-never"]) == 2
    assert "unknown zoo model" in capsys.readouterr().err
    assert not Path("/tmp/x-never").exists()
