# SPDX-License-Identifier: MIT
# bench/plot.gp: throughput vs parallel streams, one panel per link setting
# (columns) and direction (rows), one line per configuration; medians with
# the range over repetitions as error bars, from the summary TSV that
# bench/report writes next to a run's TSV. Called by bench/report -plots:
#   gnuplot -e "summary='STAMP-summary.tsv'; outdir='DIR'" bench/plot.gp
# Writes DIR/benchmarks-throughput.png (Gbit/s) and DIR/benchmarks-ratio.png
# (ratio to the interleaved native run).

set datafile separator "\t"
# Fixed y ranges: a run without one link's rows still plots (an empty
# panel) instead of failing on an empty autoscale.
# Rows of other series evaluate to NaN; treat them as missing so that the
# lines of a series connect across them.
set datafile missing NaN
set terminal pngcairo size 1400,900 font "Sans,11"
set key outside right top font ",10"
set grid
set xlabel "parallel iperf3 streams"
set logscale x 2
set xtics ("1" 1, "2" 2, "10" 10, "20" 20)
set xrange [0.8:25]

configs = "native airlock airlock-v6 airlock-kernel ocserv ocserv-dtls wireguard-go openvpn airlock-netstack airlock-seccomp airlock-preload ocserv-slirp ocserv-ocproxy slirp airlock-tcp"
colors = "#000000 #d62728 #ff9896 #ff7f0e #1f77b4 #17becf #2ca02c #9467bd #e377c2 #8c564b #7f7f7f #bcbd22 #aec7e8 #98df8a #c49c94"
cfg(i) = word(configs, i)

# Column numbers in summary.tsv.
C_CONFIG = 1; C_LINK = 2; C_DIR = 3; C_STREAMS = 4; C_GBPS = 5; C_RATIO = 7
C_GBPS_MIN = 8; C_GBPS_MAX = 9; C_RATIO_MIN = 10; C_RATIO_MAX = 11

sel(c, l, d, col) = (strcol(C_CONFIG) eq c && strcol(C_LINK) eq l && strcol(C_DIR) eq d) ? column(col) : NaN

do for [what in "throughput ratio"] {
	set output outdir."/benchmarks-".what.".png"
	set multiplot layout 2,2 title (what eq "throughput" ? "iperf3 received throughput (median over repetitions)" : "throughput as a fraction of the interleaved native run") font ",14"
	do for [d in "up down"] {
		do for [l in "1gbit uncapped"] {
			set title sprintf("%s, %s", (l eq "uncapped" ? "uncapped veth" : "every veth 1 Gbit (tc tbf)"), (d eq "up" ? "job → outside" : "outside → job (-R)"))
			if (what eq "throughput") {
				set ylabel "Gbit/s"
				if (l eq "uncapped") { set logscale y; set yrange [0.1:100] } else { unset logscale y; set yrange [0:1.05] }
				col = C_GBPS; lo = C_GBPS_MIN; hi = C_GBPS_MAX
			} else {
				unset logscale y
				set ylabel "ratio to native"
				set yrange [0:1.2]
				col = C_RATIO; lo = C_RATIO_MIN; hi = C_RATIO_MAX
			}
			plot for [i=1:words(configs)] summary using (sel(cfg(i), l, d, C_STREAMS)):(sel(cfg(i), l, d, col)):(sel(cfg(i), l, d, lo)):(sel(cfg(i), l, d, hi)) \
				with yerrorlines lw 2 pt 7 lc rgb word(colors, i) title cfg(i)
		}
	}
	unset multiplot
}
