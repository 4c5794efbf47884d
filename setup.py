from setuptools import Extension, find_packages, setup

import re

with open("metaq/__init__.py") as f:
    VERSION = re.search(r'__version__ = "([^"]+)"', f.read()).group(1)

setup(
    name="metaq",
    version=VERSION,
    description="A MetaQ-style message broker: text protocol, shared commit log, transactions, replication",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["metaq", "metaq.*"]),
    # The put-burst fast path in C. Optional: if it cannot be built (no compiler,
    # no zlib headers) the install goes on and the exact pure-Python twins run.
    ext_modules=[Extension("metaq._speedups", ["metaq/_speedups.c"], libraries=["z"], optional=True)],
    python_requires=">=3.11",
    install_requires=[
        "gevent>=24.2",
        "PyYAML>=6.0",
        "pydantic>=2.6,<3",
        "kazoo>=2.10",
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "hypothesis>=6.100",
            "crcmod>=1.7",
            "pytest-timeout>=2.3",
            "psycopg[binary]>=3.1",
            "rocketmq==0.4.4",  # the official RocketMQ client (C++ core bundled): remoting tests and bench
        ],
        "spark": ["pyspark[sql]>=4.0,<5", "pandas<3", "matplotlib>=3.8", "pyarrow>=18"],
        "deploy": ["fabric>=3.2,<4", "wheel>=0.40"],
    },
    entry_points={
        "console_scripts": [
            "metaq-server = metaq.server.__main__:main",
            "metaq-admin = metaq.client.admin:main",
            "metaq-spark-report = metaq.spark.report:main",
        ],
    },
)
