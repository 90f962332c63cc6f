"""Control: the guard, the signals it reads, the latency baseline, flag persistence and reload."""
