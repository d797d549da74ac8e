"""``flatlm.core.registry``: the one table every registry is (sources, algorithms, measurements,
architectures, experiments, scales), its one lazy importer and the loading of plug-ins."""

import sys
import types

import pytest

from flatlm.core import registry as core
from flatlm.core.registry import (
    LazyRef,
    Registry,
    load_plugins,
    load_ref,
    plugin_modules,
    plugins_in,
)


def _colours() -> Registry:
    return Registry("colour", key="paint.colour", how_to_add="register_colour(name, rgb)")


def test_a_name_is_registered_once_unless_replaced():
    colours = _colours()
    red = colours.register("red", (255, 0, 0))
    assert colours.register("red", red) is red  # the same entry again: a no-op
    with pytest.raises(ValueError, match="colour 'red' is registered already; choose another "
                                         "name, or pass replace=True"):
        colours.register("red", (250, 0, 0))
    colours.register("blue", (0, 0, 255))
    assert colours.register("red", (250, 0, 0), replace=True) == (250, 0, 0)
    assert colours.names() == ("red", "blue")  # a replaced entry keeps its place
    with pytest.raises(ValueError, match="colour name '': use a non-empty string"):
        colours.register("", (0, 0, 0))


def test_an_unknown_name_lists_the_known_ones_and_how_to_add_one():
    colours = _colours()
    colours.register("red", 1)
    colours.register("green", 2)
    with pytest.raises(ValueError) as e:
        colours.lookup("blue")
    assert str(e.value) == ("paint.colour='blue': use one of red, green (add one with "
                            "register_colour(name, rgb))")
    with pytest.raises(KeyError):  # the mapping itself stays a plain mapping
        colours["blue"]


def test_an_entry_check_runs_before_it_is_added():
    def no_negative(name, value):
        if value < 0:
            raise ValueError(f"{name}: negative")

    numbers = Registry("number", key="n", how_to_add="register", check=no_negative)
    with pytest.raises(ValueError, match="minus: negative"):
        numbers.register("minus", -1)
    assert "minus" not in numbers


@pytest.mark.parametrize(("registry", "key", "verb"), [
    ("flatlm.sources.spec:REGISTRY", "source", "register_source"),
    ("flatlm.train.registry:REGISTRY", "train.algorithm", "register_algorithm"),
    ("flatlm.measure.registry:MEASUREMENTS", "measure.what", "register_measurement"),
    ("flatlm.models.architectures:ARCHITECTURES", "model.arch", "register_architecture"),
    ("flatlm.experiments.paper:EXPERIMENT_BUILDERS", "experiment", "register_experiment"),
    ("flatlm.experiments.scales:SCALES", "scale", "register_scale"),
], ids=lambda x: x.split(":")[-1] if ":" in x else x)
def test_every_registry_of_flatlm_is_one(registry, key, verb):
    table = load_ref(registry)
    assert isinstance(table, Registry) and table.key == key and verb in table.how_to_add
    assert len(table) >= 2 and "--plugin MODULE" in table.unknown_message("x")


def test_a_lazy_ref_imports_its_module_on_first_use(monkeypatch):
    module = types.ModuleType("lazy_toy_mod")
    module.twice = lambda x: 2 * x
    hook = LazyRef("lazy_toy_mod:twice")  # nothing imported yet: the module does not exist
    assert hook == LazyRef("lazy_toy_mod:twice") and hook != LazyRef("lazy_toy_mod:other")
    with pytest.raises(ModuleNotFoundError):
        hook(1)
    monkeypatch.setitem(sys.modules, "lazy_toy_mod", module)
    assert hook(3) == 6 and load_ref("lazy_toy_mod:twice") is module.twice
    with pytest.raises(ValueError, match="module lazy_toy_mod has no 'thrice'"):
        load_ref("lazy_toy_mod:thrice")
    with pytest.raises(ValueError, match="write 'module:name'"):
        LazyRef("lazy_toy_mod.twice")
    assert load_ref(len) is len  # a function is itself


def test_plugins_are_read_from_the_command_line_the_environment_and_entry_points(monkeypatch):
    assert plugins_in(["trial", "--plugin", "a.b", "--out", "x", "--plugin=c", "--", "--plugin",
                       "d"]) == ["a.b", "c"]
    monkeypatch.setattr(core.importlib.metadata, "entry_points",
                        lambda group: [types.SimpleNamespace(value="pkg.plug:ignored")]
                        if group == "flatlm.plugins" else [])
    assert plugin_modules(["c", "a.b"], " a.b ,e,") == ("pkg.plug", "a.b", "e", "c")


IMPORTS: list[str] = []  # what the plug-in module below appends to when it is imported


def test_load_plugins_imports_once_and_names_a_missing_module(monkeypatch, tmp_path):
    (tmp_path / "plugin_toy_mod.py").write_text(
        "from tests.test_registry import IMPORTS\nIMPORTS.append(__name__)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(core, "_LOADED", [])
    monkeypatch.delitem(sys.modules, "plugin_toy_mod", raising=False)
    IMPORTS.clear()
    assert load_plugins(["plugin_toy_mod"]) == ("plugin_toy_mod",)
    assert load_plugins(["plugin_toy_mod"]) == ("plugin_toy_mod",)
    assert IMPORTS == ["plugin_toy_mod"] and core.loaded_plugins() == ("plugin_toy_mod",)
    with pytest.raises(ValueError, match="plug-in 'no_such_plugin_mod' .*cannot import it"):
        load_plugins(["no_such_plugin_mod"])
    assert core.loaded_plugins() == ("plugin_toy_mod",)
    sys.modules.pop("plugin_toy_mod", None)


# Issue 52, item 4: a plug-in that fails to import other than by being absent ended the command
# in a traceback; each way is one line naming where it was given and the fix.
BROKEN_PLUGINS = {
    "raises": ("raise RuntimeError('boom')\n",
               r"plug-in 'broken_raises_mod' \(--plugin\): importing it raised RuntimeError: "
               r"boom \(at .*broken_raises_mod\.py:1\): fix the module, or leave it out"),
    "missing": ("import no_such_dependency_mod\n",
                r"plug-in 'broken_missing_mod' \(--plugin\) imports 'no_such_dependency_mod', "
                r"which is not installed: install it"),
    "syntax": ("x = (\n", r"plug-in 'broken_syntax_mod' \(--plugin\): importing it raised "
                          r"SyntaxError: .* \(at .*broken_syntax_mod\.py:1\)"),
}


def _plant(tmp_path, monkeypatch, kind: str) -> str:
    module = f"broken_{kind}_mod"
    (tmp_path / f"{module}.py").write_text(BROKEN_PLUGINS[kind][0])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(core, "_LOADED", [])
    return module


@pytest.mark.parametrize("kind", sorted(BROKEN_PLUGINS))
def test_a_plugin_that_fails_to_import_is_one_line_naming_the_flag(kind, tmp_path, monkeypatch):
    module = _plant(tmp_path, monkeypatch, kind)
    with pytest.raises(ValueError, match=BROKEN_PLUGINS[kind][1]) as e:
        load_plugins([module], {module: "--plugin"})
    assert "\n" not in str(e.value) and core.loaded_plugins() == ()


@pytest.mark.parametrize("given", ["plugins/my_plugin.py", "my_plugin.py", "/abs/my_plugin.py"])
def test_a_plugin_given_as_a_file_path_names_its_module(given):
    with pytest.raises(ValueError, match=rf"plug-in '{given}' \(--plugin\) is a file path: give "
                                         r"its module name \(my_plugin\), with its directory"):
        load_plugins([given], {given: "--plugin"})


def test_the_message_says_which_of_the_flag_and_the_variable_named_it(tmp_path, monkeypatch):
    module = _plant(tmp_path, monkeypatch, "raises")
    with pytest.raises(ValueError, match=rf"'{module}' \(FLATLM_PLUGINS\)"):
        core.load_command_plugins([], {"FLATLM_PLUGINS": module})
    with pytest.raises(ValueError, match=rf"'{module}' \(--plugin\)"):
        core.load_command_plugins(["--plugin", module], {})
