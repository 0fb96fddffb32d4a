"""The sharded test fabric: three switches, a host on each, and host ``dual`` on two switches.

Shared by the shard tests on ibsim (tests/integration/test_ibsim_shards.py, the hand-off and
HA fault tests): GUIDs chosen so that every assignment rule matters, the shard of each node
for N = 2 written out (not computed by ``ibmon.sources.shard``). ``dual`` is cabled to sw-b
(shard 0) and sw-c (shard 1) and goes with the lower-GUID switch, sw-b: take its link to sw-b
away and it belongs to shard 1.
"""

from __future__ import annotations

__all__ = ["ALL", "DUAL", "H1", "H2", "H3", "NETFILE", "SHARDS_OF_2", "SW_A", "SW_B", "SW_C"]

SW_A, SW_B, SW_C = "0x0002c90000000a00", "0x0002c90000000d00", "0x0002c90000000f00"
H1, H2, H3, DUAL = ("0x0002c90000001400", "0x0002c90000001100", "0x0002c90000001500",
                    "0x0002c90000001000")
ALL = {SW_A, SW_B, SW_C, H1, H2, H3, DUAL}
#: sha1 shard of each node for N = 2, written out (not computed by ibmon.sources.shard).
SHARDS_OF_2 = {
    0: {SW_B, H2, DUAL},
    1: {SW_A, SW_C, H1, H3},
}

NETFILE = """\
# three switches, a host on each, and host "dual" cabled to sw-b and sw-c
vendid=0x2c9
devid=0xc738
switchguid=0x0002c90000000a00(2c90000000a00)
Switch\t8 "S-0002c90000000a00"\t\t# "sw-a" base port 0 lid 0 lmc 0
[1]\t"S-0002c90000000d00"[1]\t\t# "sw-b" lid 0 4xEDR
[2]\t"S-0002c90000000f00"[1]\t\t# "sw-c" lid 0 4xEDR
[3]\t"H-0002c90000001400"[1](2c90000001401)\t\t# "h1" lid 0 4xEDR

vendid=0x2c9
devid=0xc738
switchguid=0x0002c90000000d00(2c90000000d00)
Switch\t8 "S-0002c90000000d00"\t\t# "sw-b" base port 0 lid 0 lmc 0
[1]\t"S-0002c90000000a00"[1]\t\t# "sw-a" lid 0 4xEDR
[2]\t"H-0002c90000001100"[1](2c90000001101)\t\t# "h2" lid 0 4xEDR
[3]\t"H-0002c90000001000"[1](2c90000001001)\t\t# "dual" lid 0 4xEDR

vendid=0x2c9
devid=0xc738
switchguid=0x0002c90000000f00(2c90000000f00)
Switch\t8 "S-0002c90000000f00"\t\t# "sw-c" base port 0 lid 0 lmc 0
[1]\t"S-0002c90000000a00"[2]\t\t# "sw-a" lid 0 4xEDR
[2]\t"H-0002c90000001500"[1](2c90000001501)\t\t# "h3" lid 0 4xEDR
[3]\t"H-0002c90000001000"[2](2c90000001002)\t\t# "dual" lid 0 4xEDR

vendid=0x2c9
devid=0x1017
caguid=0x0002c90000001400
Ca\t1 "H-0002c90000001400"\t\t# "h1"
[1](2c90000001401) \t"S-0002c90000000a00"[3]\t\t# lid 0 lmc 0 "sw-a" lid 0 4xEDR

vendid=0x2c9
devid=0x1017
caguid=0x0002c90000001100
Ca\t1 "H-0002c90000001100"\t\t# "h2"
[1](2c90000001101) \t"S-0002c90000000d00"[2]\t\t# lid 0 lmc 0 "sw-b" lid 0 4xEDR

vendid=0x2c9
devid=0x1017
caguid=0x0002c90000001500
Ca\t1 "H-0002c90000001500"\t\t# "h3"
[1](2c90000001501) \t"S-0002c90000000f00"[2]\t\t# lid 0 lmc 0 "sw-c" lid 0 4xEDR

vendid=0x2c9
devid=0x1017
caguid=0x0002c90000001000
Ca\t2 "H-0002c90000001000"\t\t# "dual"
[1](2c90000001001) \t"S-0002c90000000d00"[3]\t\t# lid 0 lmc 0 "sw-b" lid 0 4xEDR
[2](2c90000001002) \t"S-0002c90000000f00"[3]\t\t# lid 0 lmc 0 "sw-c" lid 0 4xEDR
"""
