"""`python -m train ...`: the entry point of one training run; orchestration/train_cli.py does the work
(a `__main__` module is imported by nothing: it sits above every layer)."""

if __name__ == "__main__":
    from infra import allocator
    from infra.process_exit import exit_now

    allocator.ensure()  # before anything else: may re-exec this process with the allocator preloaded
    from orchestration.train_cli import main

    exit_now(main())  # no interpreter teardown: vLLM's and gloo's threads outlive it (infra/process_exit.py)
