"""``autoplan emit``: a run dir with the torchrun program's inputs and the same plan for other tools.

Pure Python (no torch): ``writer`` assembles the files from ``launch`` (launch.sh,
slurm.sbatch), ``megatron`` (Megatron-LM arguments), ``deepspeed`` (DeepSpeed config JSON)
and ``torchtitan`` (torchtitan TOML).
"""
