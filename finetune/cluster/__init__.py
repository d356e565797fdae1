"""Slurm as a place to run (docs/cluster.md).

scheduler.py   the Slurm commands (sbatch, squeue, scontrol, sacct, scancel, sinfo, srun), the run's job record
               (slurm.json) and a run's state: Slurm's word on the job merged with the run's own status.json, so
               a dead job is never shown running; below finetune/runs (rundir.py and the manager read it)
script.py      the batch script, rendered from the config and its plan: what is shown, saved and submitted
slurm.py       submitting (every check first), resuming, and what the job does before its ranks start
"""
