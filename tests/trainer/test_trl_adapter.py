"""TRL behind one adapter (gtpo.trainer.trl_adapter, with the forward's own door gtpo.forward.trl_head): every private
TRL name gtpo relies on is checked when gtpo's trainer is imported, and a TRL that lacks one (or changed a hook's
parameters) fails in one line naming it and the supported versions. Stand-in modules and classes, each missing one
piece, play the TRL outside the pin."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
from trl import GRPOTrainer

from gtpo.trainer import trl_adapter

PIECES = [(module, name) for module, names in trl_adapter.PRIVATE_NAMES.items() for name in names]


def test_the_installed_trl_has_every_piece():
    assert trl_adapter.problem() is None


@pytest.mark.parametrize("module, name", PIECES, ids=[f"{m}.{n}" for m, n in PIECES])
def test_a_trl_without_one_private_name_fails_in_one_line_naming_it(module, name):
    modules = trl_adapter._modules()
    stand_in = SimpleNamespace(**{k: v for k, v in vars(modules[module]).items() if k != name})
    modules[module] = stand_in
    with pytest.raises(ImportError) as caught:
        trl_adapter.check(modules, version="9.9.9")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("gtpo needs trl==1.16.*: in the installed trl 9.9.9,")
    assert f"{module}.{name} is missing" in message


@pytest.mark.parametrize("hook", sorted(trl_adapter.HOOKS))
def test_a_trl_whose_hook_is_missing_or_changed_fails_in_one_line(hook):
    missing = type("StandIn", (GRPOTrainer,), {})
    missing_attr = SimpleNamespace(**{h: getattr(GRPOTrainer, h) for h in trl_adapter.HOOKS if h != hook})
    assert trl_adapter.problem(trainer_class=missing) is None  # a subclass inherits every hook
    assert trl_adapter.problem(trainer_class=missing_attr) == f"GRPOTrainer.{hook} is missing"

    def changed(self, something_else):  # the same name, other parameters
        return None

    altered = type("Altered", (GRPOTrainer,), {hook: changed})
    with pytest.raises(ImportError, match=rf"GRPOTrainer\.{hook}\(self, something_else\) is not \("):
        trl_adapter.check(trainer_class=altered)


def test_gtpo_trainer_overrides_the_hooks_with_trls_parameters():
    """Each hook GTPOTrainer overrides takes exactly TRL's parameters (what the adapter checks TRL has)."""
    from gtpo import GTPOTrainer

    for hook in trl_adapter.HOOKS:
        if hook in vars(GTPOTrainer):
            ours = list(inspect.signature(getattr(GTPOTrainer, hook)).parameters)
            theirs = list(inspect.signature(getattr(GRPOTrainer, hook)).parameters)
            if hook == "_get_per_token_logps_and_entropies":  # TRL's vision inputs pass through as **extra
                assert ours == [*theirs[:8], "extra"], hook
                continue
            assert ours == theirs, hook


def test_the_forwards_door_checks_its_names_and_the_trainers_checks_them_too():
    """gtpo.forward.trl_head checks the LM head's TRL names when the forward is imported (so `gtpo inspect`, which
    imports no trainer, fails in the same one line), and the trainer's adapter checks them again with its own."""
    from gtpo.forward import trl_head

    assert set(trl_head.PRIVATE_NAMES) < set(trl_adapter.PRIVATE_NAMES)
    modules = trl_head.modules()
    modules["trl.kernels.chunked_logprob"] = SimpleNamespace()
    with pytest.raises(ImportError, match=r"^gtpo needs trl==1\.16\.\*: in the installed trl 9\.9\.9, trl\.kernels"):
        trl_head.check(modules, version="9.9.9")


def test_private_trl_modules_are_imported_only_by_the_adapters():
    """The modules holding TRL's private names (its kernels, the trainer utils, the trainer module) are imported by
    the two doors alone, the forward's (the head's names) and the trainer's (the trainer module); the rest of gtpo
    takes them from these, and no module of the forward imports the trainer module."""
    import ast
    from pathlib import Path

    private = {"trl.kernels.chunked_logprob", "trl.kernels", "trl.trainer.grpo_trainer"}
    offenders = []
    root = Path(trl_adapter.__file__).parents[1]
    for path in root.rglob("*.py"):
        if path.name == "trl_adapter.py" or path == root / "forward" / "trl_head.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            # the utils module as an object (to read or patch its private names) is the adapter's; its public
            # functions (`from trl.trainer.utils import pad`) may be imported anywhere
            whole_utils = "trl.trainer.utils" in names and getattr(node, "module", None) != "trl.trainer.utils"
            if whole_utils or any(n in private for n in names):
                offenders.append(f"{path.name}:{node.lineno}")
            if path.parent.name == "forward" and any("grpo_trainer" in n or n == "trl.GRPOTrainer" for n in names):
                offenders.append(f"forward/{path.name}:{node.lineno}")
    assert offenders == []
