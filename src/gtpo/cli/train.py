"""`gtpo train`: parse the recipe and flags, check everything a user can get wrong, open the run folder, train
GTPO (or GRPO) with the collapse warning attached, then plot the curves and print the summary."""

from __future__ import annotations

from gtpo.cli.arguments import DEFAULT_TRAIN_RECIPE, train_parser
from gtpo.cli.run_setup import load_dataset_for, open_run_dir, plan_run_dir, plot_run, print_summary
from gtpo.errors import user_input
from gtpo.trainer import policy
from gtpo.trainer.policy import check_model_name


def parse_train_args(argv: list[str]):
    """`gtpo train`'s command line as ((TrainScriptArguments, GTPOConfig, ModelConfig), recipe); nothing is run.
    Without --config the recipe is the offline default run's."""
    return train_parser().parse(argv, defaults=None if "--config" in argv else DEFAULT_TRAIN_RECIPE)


def run_train(argv: list[str]) -> int:
    from gtpo.tasks import get_reward_funcs
    from gtpo.trainer.callbacks import CollapseWarningCallback
    from gtpo.trainer.trainer import GTPOTrainer

    (script_args, training_args, model_args), recipe = parse_train_args(argv)
    # Everything the user can get wrong is checked before the run folder is made and the model loaded.
    with user_input():
        run_dir = plan_run_dir(training_args, script_args, argv)
        reward_funcs = get_reward_funcs(script_args.reward_funcs)
        check_model_name(model_args, "gtpo train")
        dataset = load_dataset_for(script_args, seed=training_args.data_seed or training_args.seed)
        open_run_dir("train", argv, recipe, script_args, training_args, model_args, dataset)
    print(
        f"gtpo train: {training_args.algorithm} on {script_args.task} with {model_args.model_name_or_path}; "
        f"run folder {run_dir}"
    )

    def attach_collapse_warning(trainer):  # first: loggers see monitor/*
        CollapseWarningCallback(action=script_args.collapse_warning).attach(trainer)

    result = policy.train_policy(
        GTPOTrainer,
        dataset,
        training_args,
        model_args,
        run_dir,
        "gtpo train",
        prepare=attach_collapse_warning,
        reward_funcs=reward_funcs,
    )
    if training_args.process_index == 0:
        figures = plot_run(run_dir) if script_args.plot else []
        print_summary(run_dir, result["wall"], result["model_dir"], figures)
    return 0
