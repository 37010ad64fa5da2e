"""Names of the files an XTuner run keeps in its run folder, shared by the host side
(plugin, config writer) and the worker; stdlib only, as the worker's env has no pydantic."""

CONFIG_NAME = "xtuner_config.py"  # the generated mmengine config
DATA_DIR = "xtuner_data"  # the packed rows as a HF dataset (`load_from_disk`), written by the worker
WORK_DIR = "xtuner_work"  # mmengine work_dir: <timestamp>/vis_data/scalars.json is XTuner's own log
