"""The learning plane (paper Algorithm 1, learner side): `recipe.Trainer` holds the components below and calls
them; none of them calls back into it.

    recipe.py       Trainer: setup -> run -> save -> close
    build.py        Config -> the flat arguments of each part (learner, buffer, coordinator, workers, delivery)
    publication.py  the one owner of v_t: advance it, publish every kappa updates, remember what was published
    replay.py       the worker audit and its replay of records under the version they claim
    metrics.py      one metrics.jsonl row per update and the run's summary
    run_secrets.py  the run's token and manifest signing key, as checkpoints keep them
    calibration.py  warm-up measurements (T_train, T_bcast, mu_i), the provisioning decision, the live scheduler
    console.py      the progress bar, log routing and signals
    checkpoint.py   checkpoints and resume; distributed.py the FSDP2 ranks; live_loop.py the scheduler's loop;
    status/         the live status page
"""
