"""mindformers_core: the MindFormers parallel core as a pure-Python MindSpore extension."""
from setuptools import find_packages, setup

setup(
    name="mindformers_core",
    version="0.1.0",
    description="Tensor/pipeline/ZeRO parallel core for MindSpore, same numbers in PyNative and jit, "
                "runnable on CPU with msrun",
    # the package and every subpackage (common/, models/, ...); research/, tests/, bench/ stay out
    packages=find_packages(include=["mindformers_core", "mindformers_core.*"]),
    entry_points={"console_scripts": ["mindformers-run = mindformers_core.run:main"]},
    python_requires=">=3.11,<3.12",
    install_requires=[
        "mindspore==2.10.0",
        "numpy<2",          # MindSpore 2.10 fails with NumPy 2 ("numpy.core.multiarray failed to import")
        "pyyaml>=6,<7",
        "sentencepiece>=0.2,<0.3",
        # Hugging Face model folders are read by slice and written (models/hf): the format's own library, already a
        # MindSpore 2.10 dependency; pinned to the version that reads MindSpore's numpy bfloat16 (tested here)
        "safetensors==0.8.0",
        "tokenizers==0.23.3",   # Hugging Face's fast tokenizers: reads tokenizer.json without transformers/torch; cp311 wheels
        "psutil>=5.9",      # process-tree cleanup in the msrun harness (also a MindSpore dependency)
        # TensorBoard event files (tensorboard.tensorboard_dir / monitor.tensorboard.output_dir): the writer
        # MindFormers itself uses; pure Python (numpy, packaging, protobuf), no TensorFlow or PyTorch. 2.6.5 is
        # the newest release, tested here with protobuf 7 (what MindSpore 2.10 installs).
        "tensorboardX==2.6.5",
        # fine-tuning data (HFDataLoader, data/hf_dataset.py): the library MindFormers reads it with and users' data
        # lives in. 5.2.0 is the newest and works with numpy<2, but its pyarrow>=24 resolves to pyarrow 26, which
        # refuses NumPy 1 at import ("pyarrow requires NumPy 2.0"): pyarrow 25.0.1 is the newest that imports with
        # numpy 1.26 (tested here, with MindSpore 2.10 and datasets' fsspec<=2026.9.0)
        "datasets==5.2.0",
        "pyarrow>=24,<26",
        "jinja2>=3.1,<4",   # chat templates (ChatTemplateDataHandler), the engine transformers renders them with
    ],
    extras_require={"test": [
        "pytest>=8,<10",
        # tests read the event files back with TensorBoard's own reader (EventAccumulator); 2.21.0 is the
        # newest release and reads tensorboardX 2.6.5's files with protobuf 7
        "tensorboard==2.21.0",
    ]},
)
