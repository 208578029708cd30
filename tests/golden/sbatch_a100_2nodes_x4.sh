#!/bin/bash

# Parameters
#SBATCH --cpus-per-task=8
#SBATCH --error=<SWEEP_DIR>/.submitit/%j/%j_0_log.err
#SBATCH --gpus-per-node=4
#SBATCH --job-name=train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --open-mode=append
#SBATCH --output=<SWEEP_DIR>/.submitit/%j/%j_0_log.out
#SBATCH --partition=gpu
#SBATCH --requeue
#SBATCH --signal=USR2@120
#SBATCH --time=600
#SBATCH --wckey=submitit

# setup
export SLURM_KILL_BAD_EXIT=1

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output <SWEEP_DIR>/.submitit/%j/%j_%t_log.out --error <SWEEP_DIR>/.submitit/%j/%j_%t_log.err <PYTHON> -u -m submitit.core._submit <SWEEP_DIR>/.submitit/%j
