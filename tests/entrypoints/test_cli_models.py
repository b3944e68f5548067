"""`omnistage models` prints the support matrix from the families' declarations: a row per
native diffusion pipeline, whose cells follow what the family declares."""

from omnistage.diffusion.registry import native_keys, pipeline_class
from omnistage.diffusion.support import COLUMNS
from omnistage.entrypoints.cli import main


def test_models_prints_a_row_per_native_pipeline_from_its_declaration(capsys):
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == list(COLUMNS[:3])
    rows = {line.split()[0]: line for line in lines[1:] if line and not line.startswith(" ")}
    assert set(native_keys()) <= set(rows)
    for key in native_keys():
        decl = pipeline_class(key).supported_accelerations
        assert (", ".join(decl.step_caches) or "no") in rows[key]
    assert "ulysses_degree: its transformer has no sequence-parallel plan" in "\n".join(lines)


def test_models_markdown_is_the_docs_table(capsys):
    from omnistage.diffusion import support

    assert main(["models", "--markdown"]) == 0
    assert capsys.readouterr().out == support.markdown(support.rows()) + "\n"
