"""`gtpo sft`: supervised fine-tuning on the task's gold solutions in the paper's tag format (the SFT baseline)."""

from __future__ import annotations

from gtpo.cli.arguments import sft_parser
from gtpo.cli.run_setup import load_dataset_for, open_run_dir, plan_run_dir
from gtpo.errors import user_input
from gtpo.trainer.policy import check_model_name


def parse_sft_args(argv: list[str]):
    """`gtpo sft`'s command line as ((TaskArguments, SFTConfig, ModelConfig), recipe); nothing is run."""
    return sft_parser().parse(argv)


def run_sft(argv: list[str]) -> int:
    from gtpo.trainer.sft import sft_dataset, train_sft

    (script_args, training_args, model_args), recipe = parse_sft_args(argv)
    with user_input():
        run_dir = plan_run_dir(training_args, script_args, argv)
        check_model_name(model_args, "gtpo sft")
        rows = load_dataset_for(script_args, seed=training_args.data_seed or training_args.seed)
        dataset = sft_dataset(rows)
        open_run_dir("sft", argv, recipe, script_args, training_args, model_args, rows)
    print(f"gtpo sft: {script_args.task} gold solutions with {model_args.model_name_or_path}; run folder {run_dir}")
    result = train_sft(dataset, training_args, model_args)
    if training_args.process_index == 0:
        print(f"gtpo sft: done in {result['wall'] / 60:.1f} min; model in {result['model_dir']}")
    return 0
