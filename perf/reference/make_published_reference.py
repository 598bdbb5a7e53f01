#!/usr/bin/env python3
"""Write trtllm_bench_published.json: NVIDIA's published TensorRT-LLM throughput rows for H100.

The rows below are the markdown table lines of ``docs/source/performance/perf-overview.md``
in NVIDIA/TensorRT-LLM, copied as they stand in the stored revisions named in SOURCES
(only the Llama 3.1 8B / 70B sections).  This script parses them and keeps the H100
columns, so each number in the JSON can be traced back to a line here and a column
header there.  Nothing is computed except ``output_tokens_per_s_per_gpu`` (= total / tp).

Run with any Python 3.9+:  python3 perf/reference/make_published_reference.py [--out FILE]
"""

from __future__ import annotations

# ruff: noqa: E501  (the tables below are upstream markdown lines, kept byte for byte)
import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent

# ----------------------------------------------------------------------------- sources

SOURCES = {
    "v0.17": {
        "repo": "NVIDIA/TensorRT-LLM",
        "path": "docs/source/performance/perf-overview.md",
        "revision": "release 0.17 text: 'All data in the table below was generated using version 0.17 and "
        "presents token throughput in tokens/second.'",
        "commit": None,
        "commit_note": "read from the stored-code index (file id 859048245), which does not name the commit; "
        "the same page (intro text, v0.17 GH200 note) is what the 0.18.2 docs site serves: "
        "https://nvidia.github.io/TensorRT-LLM/0.18.2/performance/perf-overview.html. Expected "
        "upstream location: https://github.com/NVIDIA/TensorRT-LLM/blob/v0.17.0/docs/source/"
        "performance/perf-overview.md (not verified against the tag)",
        "backend": "TensorRT (engine flow): `trtllm-bench --model $model_name build --tp_size $tp_size "
        "--pp_size $pp_size --quantization FP8 --dataset $dataset_file`, then `trtllm-bench --model "
        "$model_name throughput --dataset $dataset_file --engine_dir $engine_dir` (usually with "
        "--kv_cache_free_gpu_mem_fraction 0.95, 0.90 on OOM)",
        "throughput_meaning": "Token Throughput (tokens/sec) printed by trtllm-bench throughput: OUTPUT tokens "
        "per second of the WHOLE engine (all TP GPUs), offline max-throughput (all "
        "requests queued at once, infinite rate), prefill time included; the doc's own "
        "example (3000 req x 128 out / 16.406 s = 23,406 = 'Token Throughput') confirms "
        "output tokens",
        "dataset": "synthetic, fixed ISL/OSL (stdev 0); 30000 req for 128/128, 3000 for 2048/128, 1000/1000, "
        "128/2048, 500/2000; 1500 for 128/4096, 2048/2048, 5000/500; 1000 for 20000/2000",
        "precision": "FP8 weights + FP8 KV cache (trtllm-bench build --quantization FP8)",
        "hardware": "H100 80GB HBM3 (SXM)",
    },
    "v0.14.0": {
        "repo": "NVIDIA/TensorRT-LLM",
        "path": "docs/source/performance/perf-overview.md",
        "revision": "release 0.14.0 text: 'All data in the table below was generated using version 0.14.0'",
        "commit": None,
        "commit_note": "stored-code index file id 5710131192 (commit not named); the identical table is in the "
        "fork arthurrasmusson/TensorRT-LLM at e00d4e6564921307dd264b61fe1d46f116095e0e",
        "backend": "TensorRT (engine flow), same trtllm-bench build + throughput commands as v0.17 "
        "(FP16 engines: --quantization omitted)",
        "throughput_meaning": "output tokens/s of the whole engine (all TP GPUs), offline max throughput",
        "precision": "columns 'H100 80GB HBM3 FP8' and 'H100 80GB HBM3 FP16' (FP16, not BF16)",
        "hardware": "H100 80GB HBM3 (SXM)",
    },
    "v0.20": {
        "repo": "dominicshanshan/TensorRT-LLM (fork of NVIDIA/TensorRT-LLM)",
        "path": "docs/source/performance/perf-overview.md",
        "revision": "v0.20 text: 'The data collected for the v0.20 benchmarks was run with the following file'",
        "commit": "ab4143e1d3c82df550f0d5673090a8feee84c7bd",
        "commit_note": "fork commit; the docs site page https://nvidia.github.io/TensorRT-LLM/0.20.0/performance/"
        "perf-overview.html carries the same tables",
        "backend": "PyTorch (NOT the TensorRT engine flow): 'Starting with v0.19, testing was performed using "
        "the PyTorch backend'; `trtllm-bench --model $model_name throughput --dataset $dataset_file "
        "--backend pytorch --extra_llm_api_options llm_options.yml` (CUDA graphs, padding)",
        "throughput_meaning": "'Total Output Throughput (tokens/sec)': output tokens/s of the whole engine "
        "(all TP GPUs), offline max throughput",
        "precision": "FP8 checkpoints nvidia/Llama-3.1-8B-Instruct-FP8 and nvidia/Llama-3.3-70B-Instruct-FP8 "
        "(the 70B table is Llama 3.3 70B, same architecture as 3.1 70B)",
        "hardware": "H100 80GB HBM3 (SXM)",
    },
    "v0.14.0-serving": {
        "repo": "NVIDIA/TensorRT-LLM",
        "path": "docs/source/performance/perf-overview.md",
        "revision": "section 'Online Serving Measurements' of the release 0.17 revision above (file id "
        "859048245): 'All data in the table below was generated using version 0.14.0, with 500 "
        "requests and BF16 precision.'",
        "commit": None,
        "commit_note": "see v0.17",
        "backend": "TensorRT engine served by the Triton TensorRT-LLM backend (tensorrtllm_backend)",
        "throughput_meaning": "'Output Tput (tok/s)' = output tokens/s of the whole engine; 'Total Token Tput' "
        "= input + output tokens/s; TTFT/ITL are means in ms",
        "precision": "BF16",
        "hardware": "H100 80GB HBM3 (SXM)",
    },
}

# ----------------------------------------------------------------------------- tables (verbatim rows)

# v0.17: columns after the 3 label columns: H200 FP8 | H100 FP8 | GH200 FP8 | L40S FP8 | A100 FP16
V017_COLUMNS = ["H200 FP8", "H100 FP8", "GH200 FP8", "L40S FP8", "A100 FP16"]
V017 = """
| LLaMA v3.1 8B               | 1                          | 128, 128                     | 29526.04          | 28836.77         | 29852.96      | 9104.61 | 6627.27          |
|                             |                            | 128, 2048                    | 25398.86          | 21109.38         | 21769.55      | 5365.81 | 5255.99          |
|                             |                            | 128, 4096                    | 17370.8           | 13593.65         | 14189.89      | 3025.92 | 3453.79          |
|                             |                            | 500, 2000                    | 21020.81          | 16500.69         | 17137.29      | 4273.75 | 4276.58          |
|                             |                            | 1000, 1000                   | 17537.96          | 15244.78         | 16482.77      | 4054.71 | 3786.83          |
|                             |                            | 2048, 128                    | 3794.14           | 3556.73          | 3843.95       | 1066.52 | 799.61           |
|                             |                            | 2048, 2048                   | 11968.5           | 9488.42          | 10265.9       | 2225.27 | 2424.16          |
|                             |                            | 5000, 500                    | 3987.79           | 3559.36          | 3932.58       | 981.2   | 825.13           |
|                             |                            | 20000, 2000                  | 1804.1            | 1401.31          | 1560.2        | 327.97  | 330.04           |
| LLaMA v3.1 70B              | 1                          | 128, 128                     | 4020.75           | 3378.03          | 3636.91       |         |                  |
|                             |                            | 128, 2048                    | 4165.68           | 911.62           | 2082.74       |         |                  |
|                             |                            | 128, 4096                    | 2651.75           | 426.32           | 1263.98       |         |                  |
|                             |                            | 500, 2000                    | 3018.39           | 775.57           | 1973.86       |         |                  |
|                             |                            | 1000, 1000                   | 2823.45           | 839.97           | 1746.12       |         |                  |
|                             |                            | 2048, 128                    | 465.99            | 343.29           | 424.96        |         |                  |
|                             |                            | 2048, 2048                   | 1913.8            |                  | 1086.93       |         |                  |
|                             |                            | 5000, 500                    | 560.16            | 245.34           | 422.36        |         |                  |
|                             |                            | 20000, 2000                  | 279.52            |                  |               |         |                  |
|                             | 2                          | 128, 128                     | 6823.01           | 6645.12          |               |         | 1313.96          |
|                             |                            | 128, 2048                    | 8290.35           | 6169.58          |               |         | 531.26           |
|                             |                            | 128, 4096                    | 6526.67           | 3897.06          |               |         |                  |
|                             |                            | 500, 2000                    | 6848.02           | 4972.57          |               |         | 439.41           |
|                             |                            | 1000, 1000                   | 5164.76           | 4390.53          |               |         | 472.94           |
|                             |                            | 2048, 128                    | 809               | 772.66           |               |         | 148.96           |
|                             |                            | 2048, 2048                   | 4183.88           | 2898.16          |               |         | 261.1            |
|                             |                            | 5000, 500                    | 1025.38           | 919.73           |               |         | 121.47           |
|                             |                            | 20000, 2000                  | 640.62            | 443.01           |               |         |                  |
|                             | 4                          | 128, 128                     | 11098.63          | 11127.53         |               | 1523.52 | 2733.48          |
|                             |                            | 128, 2048                    | 14156             | 11511.93         |               | 1942.66 | 2811.27          |
|                             |                            | 128, 4096                    | 10574.06          | 7439.41          |               | 1440.23 | 1976.49          |
|                             |                            | 500, 2000                    | 12452.79          | 9836.7           |               | 1634.72 | 2275.79          |
|                             |                            | 1000, 1000                   | 8911.29           | 7430.99          |               | 1209.25 | 1921.77          |
|                             |                            | 2048, 128                    | 1358.06           | 1302.6           |               | 177.72  | 325.15           |
|                             |                            | 2048, 2048                   | 7130.44           | 5480.03          |               | 969.68  | 1393.64          |
|                             |                            | 5000, 500                    | 1811.55           | 1602.78          |               | 249.52  | 392.62           |
|                             |                            | 20000, 2000                  | 1199.68           | 920.19           |               | 162.25  | 212.08           |
|                             | 8                          | 128, 128                     | 15355.84          | 14730.69         |               | 1464.03 | 4717.62          |
|                             |                            | 128, 2048                    | 21195.88          | 17061.82         |               | 2303.31 | 5241.5           |
|                             |                            | 128, 4096                    | 16941.52          | 14171.43         |               | 2018.22 | 3724.67          |
|                             |                            | 500, 2000                    | 17278.4           | 14679.33         |               | 1971.96 | 4445.37          |
|                             |                            | 1000, 1000                   | 13181.24          | 11451.16         |               | 1333.62 | 3320.41          |
|                             |                            | 2048, 128                    | 1983.03           | 1923.41          |               | 176.16  | 542.38           |
|                             |                            | 2048, 2048                   | 11142.47          | 8801.95          |               | 1200.16 | 2553.71          |
|                             |                            | 5000, 500                    | 2717.83           | 2457.42          |               | 259.71  | 696.34           |
|                             |                            | 20000, 2000                  | 1920.45           | 1512.6           |               | 209.87  | 413.38           |
"""

# v0.14.0: H200 FP8 | H100 FP8 | H100 FP16 | A100-SXM4 FP16 | A100-PCIE FP16 | L40S FP8
V014_COLUMNS = [
    "H200 FP8",
    "H100 FP8",
    "H100 FP16",
    "A100-SXM4-80GB FP16",
    "A100-PCIE-80GB FP16",
    "L40S FP8",
]
V014 = """
| LLaMA v3.1 70B  | 1000/1000                | 1             | 2585.0953           | 410.286            |                    |                    |                    |           |
|                 |                          | 2             | 4600.9616           | 4116.4444          | 785.4931           | 468.6383           | 257.972            |           |
|                 |                          | 4             | 7607.5304           | 6932.8808          | 3774.676           | 1762.6831          | 989.4082           | 1161.4814 |
|                 |                          | 8             | 13081.434           | 10730.156          | 5978.4573          | 3190.0211          | 959.8463           | 1188.1193 |
|                 | 128/128                  | 1             | 3897.2623           | 2459.6003          |                    |                    |                    |           |
|                 |                          | 2             | 5357.0227           | 5194.8171          | 3207.2866          | 1346.9692          | 806.7215           |           |
|                 |                          | 4             | 8826.9618           | 8542.3012          | 5846.8413          | 2420.8665          | 1272.6755          | 1438.0446 |
|                 |                          | 8             | 16382.9807          | 15533.1169         | 10649.4968         | 4572.3445          | 1212.0566          | 1381.7051 |
|                 | 128/2048                 | 1             | 3612.2603           | 445.7773           |                    |                    |                    |           |
|                 |                          | 2             | 7054.7235           | 5869.3998          | 822.1912           | 483.1299           |                    |           |
|                 |                          | 4             | 12763.4114          | 9017.4377          | 4982.6225          | 2492.4036          | 1435.236           | 1763.522  |
|                 |                          | 8             | 19266.0398          | 15190.1652         | 7605.5295          | 4254.2871          | 1609.2473          | 1944.1251 |
|                 | 128/4096                 | 1             | 2415.1981           |                    |                    |                    |                    |           |
|                 |                          | 2             | 5671.9561           | 3518.782           | 419.0178           | 272.9137           |                    |           |
|                 |                          | 4             | 8939.8227           | 6431.2702          | 3083.8794          | 1685.9677          | 1212.5416          | 1280.3778 |
|                 |                          | 8             | 13974.2854          | 9168.709           | 4981.9765          | 3067.5452          | 1310.091           | 1499.2441 |
|                 | 20000/2000               | 1             | 240.7202            |                    |                    |                    |                    |           |
|                 |                          | 2             | 614.318             | 397.6801           |                    |                    |                    |           |
|                 |                          | 4             | 1030.9528           | 851.8542           | 369.4269           | 179.5181           | 126.7676           | 140.5565  |
|                 |                          | 8             | 1898.9762           | 1354.5333          |                    | 362.9368           | 156.5767           | 141.1584  |
|                 | 2048/128                 | 1             | 458.1948            | 244.1842           |                    |                    |                    |           |
|                 |                          | 2             | 692.3911            | 697.3907           | 322.7016           | 144.7921           | 95.0306            |           |
|                 |                          | 4             | 1034.5773           | 1001.0771          | 688.0344           | 278.4018           | 150.6795           | 169.0386  |
|                 |                          | 8             | 2070.8157           | 1966.6072          | 1316.3086          | 550.4751           | 142.6166           | 163.6749  |
|                 | 2048/2048                | 1             | 1797.6743           | 209.1707           |                    |                    |                    |           |
|                 |                          | 2             | 3518.0774           | 2445.0093          | 166.792            | 126.1127           |                    |           |
|                 |                          | 4             | 6112.9026           | 4838.5272          | 2393.1359          | 1231.0359          | 823.4777           | 876.2254  |
|                 |                          | 8             | 9716.1934           | 7434.8117          | 4023.6978          | 2171.5323          | 858.6602           | 1001.3649 |
|                 | 500/2000                 | 1             | 2826.6665           |                    |                    |                    |                    |           |
|                 |                          | 2             | 6106.5855           | 4605.9226          | 700.5415           | 430.6129           |                    |           |
|                 |                          | 4             | 10816.8283          | 9205.3766          | 3781.082           | 2096.2441          | 1176.418           | 1470.0826 |
|                 |                          | 8             | 17693.705           | 13109.4437         | 6205.2658          | 3486.7891          | 1306.35            | 1639.2778 |
|                 | 5000/500                 | 1             | 533.6128            | 125.4236           |                    |                    |                    |           |
|                 |                          | 2             | 936.7014            | 886.6758           | 228.874            | 116.9529           | 76.1601            |           |
|                 |                          | 4             | 1386.4827           | 1313.893           | 849.1091           | 362.9361           | 209.2045           | 236.117   |
|                 |                          | 8             | 2711.5057           | 2444.9643          | 1420.5163          | 670.3742           | 203.8008           | 230.3084  |
| LLaMA v3.1 8B   | 1000/1000                | 1             | 16414.6988          | 14108.0361         | 7054.5156          | 3634.3886          | 3165.3542          | 3726.7552 |
|                 | 128/128                  | 1             | 27778.8885          | 26933.1886         | 15571.6549         | 6701.7958          | 5338.0166          | 8639.7933 |
|                 | 128/2048                 | 1             | 22948.5383          | 18995.2523         | 9150.7477          | 4963.4443          | 4250.6391          | 5101.6652 |
|                 | 128/4096                 | 1             | 15583.3035          | 11815.449          | 5368.9227          | 3011.3335          | 2568.5398          | 2774.5363 |
|                 | 20000/2000               | 1             | 1649.5453           | 1301.4754          | 562.8735           | 316.533            | 291.4776           | 270.5404  |
|                 | 2048/128                 | 1             | 3619.4309           | 3460.3545          | 1904.3259          | 795.389            | 611.8446           | 986.9134  |
|                 | 2048/2048                | 1             | 11032.9729          | 8777.6623          | 4159.6857          | 2264.9513          | 2011.1215          | 2018.303  |
|                 | 500/2000                 | 1             | 19510.4015          | 14993.328          | 7498.3331          | 3945.1912          | 3374.7133          | 4065.3921 |
|                 | 5000/500                 | 1             | 3787.6721           | 3258.2001          | 1708.0353          | 790.6631           | 703.56             | 855.9822  |
"""

# v0.20 (PyTorch backend).  8B: H200 TP1 | H100 TP1.  70B (Llama 3.3): H200 TP1,2,4,8 | H100 TP1,2,4,8
V020_8B_COLUMNS = [("H200", 1), ("H100", 1)]
V020_8B = """
| 128, 128                     |    | 27,970.14         | 27,688.36        |
| 128, 2048                    |    | 23,326.38         | 21,841.15        |
| 128, 4096                    |    | 17,508.51         | 13,730.89        |
| 500, 2000                    |    | 21,390.41         | 17,833.34        |
| 1000, 1000                   |    | 17,366.89         | 15,270.62        |
| 1000, 2000                   |    | 16,831.31         | 13,798.08        |
| 1024, 2048                   |    | 16,737.03         | 13,385.50        |
| 2048, 128                    |    | 3,488.03          | 3,414.67         |
| 5000, 500                    |    | 3,813.69          | 3,394.54         |
| 20000, 2000                  |    | 1,696.66          | 1,345.42         |
"""
V020_70B_COLUMNS = [
    ("H200", 1),
    ("H200", 2),
    ("H200", 4),
    ("H200", 8),
    ("H100", 1),
    ("H100", 2),
    ("H100", 4),
    ("H100", 8),
]
V020_70B = """
| 128, 128                     |    | 3,605.47          | 6,427.69 | 10,407.42 | 15,434.37 | 3,128.33         | 6,216.91 |           |           |
| 128, 2048                    |    | 4,315.80          | 8,464.03 | 13,508.59 | 20,759.72 | 756.42           | 5,782.57 | 11,464.94 | 17,424.32 |
| 128, 4096                    |    | 2,701.17          | 5,573.55 | 11,458.56 | 16,668.75 |                  | 3,868.37 | 8,206.39  | 12,624.61 |
| 500, 2000                    |    | 3,478.76          | 6,740.06 | 12,200.18 |           |                  | 4,684.06 | 9,903.53  | 14,553.93 |
| 1000, 1000                   |    | 2,744.32          | 5,119.72 | 8,685.44  | 12,744.51 | 742.14           | 4,247.19 | 7,435.65  | 11,018.81 |
| 1000, 2000                   |    | 2,896.44          | 5,847.26 | 9,031.21  | 13,141.17 | 533.74           | 3,866.53 | 7,611.12  | 11,139.22 |
| 1024, 2048                   |    | 2,874.18          | 5,568.61 | 8,946.71  | 13,082.62 | 530.16           | 3,796.68 | 7,575.24  | 11,004.31 |
| 2048, 128                    |    | 435.90            | 772.67   | 1,264.76  |           |                  | 736.89   | 1,213.33  | 1,839.22  |
| 2048, 2048                   |    |                   |          |           | 10,412.85 |                  |          |           |           |
| 5000, 500                    |    | 545.96            | 997.15   | 1,698.22  | 2,655.28  | 204.94           | 862.91   | 1,552.68  | 2,369.84  |
| 20000, 2000                  |    | 276.66            | 620.33   | 1,161.29  | 1,985.85  |                  | 416.13   | 903.66    | 1,554.10  |
"""

# v0.14.0 online serving (Triton), H100 rows only.  Columns:
# Model | GPU | TP | Input Length | Output Length | QPS | Tput(req/s) | Mean TTFT(ms) | Mean ITL(ms) |
# Total Token Tput (tok/s) | Output Tput (tok/s)
SERVING_H100 = """
|LLaMA 3.1 70B|H100 80GB HBM3|4|467|256|2|2|62|21|1406|498||
||||||4|4|68|24|2750|973|
||||||8|7|92|32|5256|1860|
||||||16|12|175|66|8941|3164|
||||||32|16|1229|86|11537|4083|
||||||INF|16|9123|85|11593|4103|
||||467|16|2|2|53|18|844|28|
||||||4|4|58|20|1908|63|
||||||8|8|71|24|3795|126|
||||||16|16|109|38|7492|248|
||||||32|28|1197|482|13655|452|
||||||INF|28|9126|548|13719|454|
||||202|214|2|2|48|20|780|401|
||||||4|4|51|22|1499|771|
||||||8|7|57|25|2702|1390|
||||||16|11|74|32|4364|2245|
||||||32|14|116|42|5837|3003|
||||||INF|16|4482|50|6725|3459|
|LLaMA 3.1 8B||1|467|256|2|2|23|8|1423|504|
||||||4|4|24|9|2624|929|
||||||8|8|26|9|5535|1959|
||||||16|15|30|11|10636|3765|
||||||32|26|50|19|19138|6774|
||||||INF|37|3335|39|26614|9420|
||||467|16|2|2|19|7|956|32|
||||||4|4|20|7|1910|63|
||||||8|8|22|7|3808|126|
||||||16|16|24|8|7567|251|
||||||32|31|29|10|14894|493|
||||||INF|79|3280|193|38319|1269|
||||202|214|2|2|19|7|809|416|
||||||4|4|20|8|1586|816|
||||||8|7|21|9|3047|1568|
||||||16|13|23|10|5597|2879|
||||||32|23|27|11|9381|4825|
||||||INF|39|1657|21|16117|8291|
"""

MODEL_NAMES = {
    "LLaMA v3.1 8B": "Llama-3.1-8B",
    "LLaMA v3.1 70B": "Llama-3.1-70B",
    "LLaMA 3.1 8B": "Llama-3.1-8B",
    "LLaMA 3.1 70B": "Llama-3.1-70B",
}


# ----------------------------------------------------------------------------- parsing


def _cells(line: str) -> list[str]:
    """Split one markdown table row into cells, keeping empty ones (a blank cell repeats the one above)."""
    line = line.strip()
    line = line[1:] if line.startswith("|") else line
    line = line[:-1] if line.endswith("|") else line
    return [c.strip() for c in line.split("|")]


def _num(text: str) -> float | None:
    text = text.replace(",", "").strip()
    return float(text) if text else None


def _seq(text: str) -> tuple[int, int]:
    isl, osl = (int(x) for x in text.replace("/", ",").split(","))
    return isl, osl


def _grouped(table: str, columns: list[str], source: str, keep: set[str]) -> list[dict]:
    """Parse a 'Model | TP | ISL,OSL | values...' table (v0.17 layout) or 'Model | ISL/OSL | TP | values' (v0.14)."""
    rows, model, tp, seq = [], None, None, None
    for line in table.strip().splitlines():
        cells = _cells(line)
        if source == "v0.17":
            m, t, s, values = cells[0], cells[1], cells[2], cells[3:]
        else:  # v0.14.0: model | isl/osl | tp
            m, s, t, values = cells[0], cells[1], cells[2], cells[3:]
        model = m or model
        tp = int(t) if t else tp
        seq = _seq(s) if s else seq
        for col, val in zip(columns, values, strict=False):
            if col not in keep:
                continue
            gpu, precision = col.split(" ", 1)
            tokens = _num(val)
            rows.append(
                {
                    "source": source,
                    "model": MODEL_NAMES[model],
                    "gpu": "H100 SXM 80GB",
                    "precision": precision,
                    "tp": tp,
                    "isl": seq[0],
                    "osl": seq[1],
                    "output_tokens_per_s": tokens,
                    "output_tokens_per_s_per_gpu": None
                    if tokens is None
                    else round(tokens / tp, 2),
                    "published_cell": val or "(empty)",
                    "column": col,
                }
            )
    return rows


def _v020(table: str, columns, model: str) -> list[dict]:
    rows = []
    for line in table.strip().splitlines():
        cells = _cells(line)
        isl, osl = _seq(cells[0])
        for (gpu, tp), val in zip(columns, cells[2:], strict=False):
            if gpu != "H100":
                continue
            tokens = _num(val)
            rows.append(
                {
                    "source": "v0.20",
                    "model": model,
                    "gpu": "H100 SXM 80GB",
                    "precision": "FP8",
                    "tp": tp,
                    "isl": isl,
                    "osl": osl,
                    "output_tokens_per_s": tokens,
                    "output_tokens_per_s_per_gpu": None
                    if tokens is None
                    else round(tokens / tp, 2),
                    "published_cell": val or "(empty)",
                    "column": f"{gpu} TP{tp}",
                }
            )
    return rows


def _serving(table: str) -> list[dict]:
    rows, model, tp, isl, osl = [], None, None, None, None
    for line in table.strip().splitlines():
        c = _cells(line)
        model = MODEL_NAMES.get(c[0], model) if c[0] else model
        tp = int(c[2]) if c[2] else tp
        isl = int(c[3]) if c[3] else isl
        osl = int(c[4]) if c[4] else osl
        rows.append(
            {
                "source": "v0.14.0-serving",
                "model": model,
                "gpu": "H100 SXM 80GB",
                "precision": "BF16",
                "tp": tp,
                "isl": isl,
                "osl": osl,
                "qps": c[5],
                "throughput_req_per_s": _num(c[6]),
                "mean_ttft_ms": _num(c[7]),
                "mean_itl_ms": _num(c[8]),
                "total_token_tokens_per_s": _num(c[9]),
                "output_tokens_per_s": _num(c[10]),
            }
        )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--out",
        default=str(
            HERE.parent.parent / "tests" / "data" / "reference" / "trtllm_bench_published.json"
        ),
    )
    args = ap.parse_args(argv)
    rows = (
        _grouped(V017, V017_COLUMNS, "v0.17", {"H100 FP8"})
        + _grouped(V014, V014_COLUMNS, "v0.14.0", {"H100 FP8", "H100 FP16"})
        + _v020(V020_8B, V020_8B_COLUMNS, "Llama-3.1-8B")
        + _v020(V020_70B, V020_70B_COLUMNS, "Llama-3.3-70B")
    )
    record = {
        "description": "NVIDIA-published trtllm-bench (offline max-throughput) numbers for H100 SXM, Llama 3.1 "
        "8B / 70B. Primary reference for the TensorRT engine flow: source 'v0.17' (last release "
        "measured with engines; v0.19+ switched to the PyTorch backend). Empty published cells "
        "are kept with output_tokens_per_s null.",
        "sources": SOURCES,
        "field_meaning": {
            "output_tokens_per_s": "as published: output tokens/s of the whole engine (all tp GPUs), offline "
            "max-throughput run, prefill included (not per GPU)",
            "output_tokens_per_s_per_gpu": "output_tokens_per_s / tp (computed here)",
            "published_cell": "the table cell exactly as printed",
        },
        "rows": rows,
        "serving_rows": _serving(SERVING_H100),
        "generator": "perf/reference/make_published_reference.py",
    }
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    n = sum(r["output_tokens_per_s"] is not None for r in rows)
    print(
        f"wrote {args.out}: {len(rows)} throughput rows ({n} with a number), "
        f"{len(record['serving_rows'])} serving rows"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
