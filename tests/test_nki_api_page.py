"""docs/nki-api.md: every name of AWS's NKI API reference with its status here
(torch_neuronx/nki/api_status.py, names from torch_neuronx/nki/api_reference.py)."""

import pathlib
import re
import subprocess
import sys

import pytest

from torch_neuronx.nki import api_reference, api_status

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "nki-api.md"
SDK_MIRROR = pathlib.Path("/work/.mirror/aws-neuron+aws-neuron-sdk/repo")
ROW = re.compile(r"^\| `(nki(?:\.\w+)*)` \| [^|]* \| (supported|\*\*differs\*\*: .*|missing) \|$")


def _page_rows():
    rows = {}
    for line in PAGE.read_text().splitlines():
        m = ROW.match(line)
        if m:
            rows[m.group(1)] = "differs" if m.group(2).startswith("**differs**") else m.group(2)
    return rows


def test_page_is_current():
    assert api_status.PAGE == PAGE
    assert api_status.page_is_current(PAGE.read_text()), (
        f"docs/nki-api.md is out of date: run `{api_status.REGENERATE}`")


def test_page_is_current_notices_a_change():
    page = PAGE.read_text()
    assert not api_status.page_is_current(page.replace("| `nki.isa.nc_matmul` | NKI ISA | supported |",
                                                       "| `nki.isa.nc_matmul` | NKI ISA | missing |"))
    assert not api_status.page_is_current(page + "\n")


def test_every_row_matches_what_resolves():
    rows = _page_rows()
    # every name of both references has a row (the previous reference's shared names appear once)
    names = {n for _t, _c, _p, ns in api_reference.REFERENCES.values() for n, _s in ns}
    assert set(rows) == names
    for name, st in rows.items():
        if st == "missing":
            assert not api_status.resolve(name), f"{name} is marked missing but resolves"
        else:
            assert api_status.resolve(name), f"{name} is marked {st} but does not resolve"
        assert (st == "differs") == (name in api_status.DIFFERENCES and api_status.resolve(name)), name


def test_counts_in_the_page_add_up():
    text = PAGE.read_text()
    for key in ("current", "previous"):
        rows = api_status.rows(key)
        if key == "previous":
            current = {n for n, _s in api_reference.REFERENCES["current"][3]}
            rows = [r for r in rows if r[0] not in current]
        counts = {s: sum(r[3] == s for r in rows) for s in api_status.STATUSES}
        line = f"{len(rows)} names: supported {counts['supported']}, differs {counts['differs']}, missing {counts['missing']}."
        assert line in text
    assert sum(counts.values()) == len(rows)


def test_resolve():
    assert api_status.resolve("nki.jit")
    assert api_status.resolve("nki.isa.nc_matmul")
    assert api_status.resolve("nki.language.tile_size.pmax")
    assert api_status.resolve("nki.isa.engine.vector")          # an enum member
    assert api_status.resolve("nki.compiler.sbuf.mod_alloc")    # a submodule's function
    assert not api_status.resolve("nki.isa.no_such_instruction")
    assert not api_status.resolve("nki.language.tile_size.no_such_field")
    assert not api_status.resolve("nki.no_such_module.x")       # an import that fails is missing
    assert not api_status.resolve("numpy.add")                  # only names under nki
    assert not api_status.resolve("nki.jit.no_such_attribute")  # attributes of a function are not imported


def test_statuses_of_known_names():
    assert api_status.status("nki.isa.nc_matmul") == "supported"
    assert api_status.status("nki.benchmark") == "differs"
    assert api_status.status("nki.language.tile_size.psum_min_align") == "missing"  # AWS gives no value


def test_differences_name_reference_entries_with_a_reason():
    names = {n for _t, _c, _p, ns in api_reference.REFERENCES.values() for n, _s in ns}
    for name, reason in api_status.DIFFERENCES.items():
        assert name in names, f"{name} is not a name of AWS's reference"
        assert len(reason) > 20 and "\n" not in reason


def test_reference_data():
    assert set(api_reference.REFERENCES) == {"current", "previous"}
    for key, (title, commit, pages, names) in api_reference.REFERENCES.items():
        assert re.fullmatch(r"[0-9a-f]{40}", commit)
        assert pages and all(p.endswith(".rst") for p in pages)
        qualified = [n for n, _s in names]
        assert len(qualified) == len(set(qualified)), f"{key}: duplicate names"
        assert all(n.startswith("nki") for n in qualified)
    current = {n for n, _s in api_reference.REFERENCES["current"][3]}
    assert {"nki.jit", "nki.simulate", "nki.isa.nc_matmul", "nki.language.ndarray",
            "nki.collectives.all_reduce", "nki.language.tile_size.pmax"} <= current
    assert "nki.language.divide" not in current     # commented out in AWS's page: "not supported"
    previous = {n for n, _s in api_reference.REFERENCES["previous"][3]}
    assert {"nki.benchmark", "nki.baremetal", "nki.simulate_kernel", "nki.compiler.sbuf.mod_alloc"} <= previous


@pytest.mark.skipif(not SDK_MIRROR.exists(), reason="no local mirror of aws-neuron/aws-neuron-sdk")
def test_reference_data_is_what_the_extractor_reads(tmp_path):
    """The checked-in names are what scripts/nki_api_reference.py reads from AWS's sources."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import nki_api_reference as extractor
    finally:
        sys.path.pop(0)
    try:
        references = extractor.extract(str(SDK_MIRROR))
    except subprocess.CalledProcessError as error:          # a mirror without the pinned commits
        pytest.skip(f"the mirror lacks the reference's commits: {error}")
    pinned = {key: commit for key, (_t, commit, _p, _n) in api_reference.REFERENCES.items()}
    if {key: commit for key, _t, commit, _p, _n in references} != pinned:
        pytest.skip("the mirror's reference has moved on; rerun scripts/nki_api_reference.py to update")
    assert extractor.render(references) == (ROOT / "torch_neuronx" / "nki" / "api_reference.py").read_text()
