from setuptools import find_packages, setup

setup(
    name="mindrlhf",
    version="0.1.0",
    description="MindSpore-native GRPO post-training for LLMs (Qwen2/Qwen2.5/Llama)",
    packages=find_packages(include=["mindrlhf", "mindrlhf.*"]),
    python_requires=">=3.9",
    install_requires=[
        "mindspore==2.10.0",
        "numpy<2",
        "pyyaml",
        "tokenizers",
        "tqdm",
        "safetensors",
        "jinja2",          # model folders' chat templates
        # LaTeX answers (mindrlhf/reward/latex.py): its verdicts are rewards, so the version whose verdicts
        # tests/test_math_answers.py records (an upgrade: re-record them there, then move this pin)
        "math-verify==0.9.0",
    ],
    extras_require={
        # reference implementations used only by tests and benchmarks
        # gguf + accelerate: transformers' GGUF loader, for scripts/get_smollm2.py (the real-model tests)
        # peft: the LoRA reference (tests/test_lora.py)
        "test": ["pytest", "torch==2.13.0", "transformers", "sentencepiece", "matplotlib", "tensorboard", "gguf",
                 "accelerate", "peft", "pyarrow<26"],     # parquet input to rlhf_data.py (pyarrow 26 needs NumPy 2)
        "plot": ["matplotlib"],
    },
)
