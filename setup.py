"""Install: pip install -e .   (CPU JAX by default; for GPUs install jax[cuda12] first or after.)"""

from setuptools import find_packages, setup

setup(
    name="transformer",
    version="0.1.0",
    description="A paper-faithful JAX/Flax Transformer (Vaswani et al., 2017) for machine translation",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["transformer", "transformer.*"]),
    package_data={"transformer.data": ["multi30k/*.gz", "multi30k/README.md"]},
    install_requires=[
        "jax>=0.4.35",
        "flax>=0.10.0",
        "optax>=0.2.3",
        "orbax-checkpoint>=0.11.0",
        "tensorflow-datasets>=4.9.7",
        "array_record>=0.5.1",
        "importlib_resources",  # needed by tensorflow-datasets' WMT builders without TensorFlow
        "h5py",                 # likewise
        "etils[epath]",         # paths that may be gs:// (TFDS's own path library)
        "ml-collections>=0.1.1",
        "absl-py>=2.0",
        "sentencepiece>=0.2.0",
        "sacrebleu>=2.4.0",
        "sacremoses>=0.1.1",    # Moses tokenizer for the paper's tokenized BLEU
        "numpy>=1.26",
        "matplotlib>=3.7",      # figures: run comparisons, attention maps (plot.py, attention.py)
        "tensorboardX>=2.6",    # TensorBoard event files without TensorFlow (metrics.py)
        "tqdm>=4.64",           # the progress bar on a terminal (progress.py)
    ],
    extras_require={"test": ["pytest>=7.0",
                             "tensorboard>=2.14"]},  # tests read the event files back with it
    entry_points={"console_scripts": [
        "transformer-train=transformer.train:run",
        "transformer-eval=transformer.evaluate:run",
        "transformer-info=transformer.info:run",
        "transformer-benchmark=transformer.benchmark:run",
        "transformer-average=transformer.average:run",
        "transformer-translate=transformer.translate:run",
        "transformer-plot=transformer.plot:run",
        "transformer-attention=transformer.attention:run",
    ]},
)
