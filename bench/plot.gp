# bench/plot.gp: throughput vs parallel streams, one panel per link setting
# (columns) and direction (rows), one line per configuration; medians from
# summary.tsv. Called by run.sh:
#   gnuplot -e "summary='DIR/summary.tsv'; outdir='DIR'" bench/plot.gp
# Writes DIR/benchmarks-throughput.png (Gbit/s) and DIR/benchmarks-ratio.png
# (ratio to the interleaved native run).

set datafile separator "\t"
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

configs = "native airlock airlock-netstack airlock-kernel airlock-seccomp airlock-preload ocserv ocserv-slirp ocserv-ocproxy slirp"
colors = "#000000 #d62728 #e377c2 #ff7f0e #17becf #8c564b #1f77b4 #9467bd #bcbd22 #2ca02c"
cfg(i) = word(configs, i)

# Column numbers in summary.tsv.
C_CONFIG = 1; C_LINK = 2; C_DIR = 3; C_STREAMS = 4; C_GBPS = 5; C_RATIO = 7

sel(c, l, d, col) = (strcol(C_CONFIG) eq c && strcol(C_LINK) eq l && strcol(C_DIR) eq d) ? column(col) : NaN

do for [what in "throughput ratio"] {
	set output outdir."/benchmarks-".what.".png"
	set multiplot layout 2,2 title (what eq "throughput" ? "iperf3 received throughput (median over repetitions)" : "throughput as a fraction of the interleaved native run") font ",14"
	do for [d in "up down"] {
		do for [l in "1gbit uncapped"] {
			set title sprintf("%s, %s", (l eq "uncapped" ? "uncapped veth" : "every veth 1 Gbit (tc tbf)"), (d eq "up" ? "job → outside" : "outside → job (-R)"))
			if (what eq "throughput") {
				set ylabel "Gbit/s"
				if (l eq "uncapped") { set logscale y; set yrange [0.1:*] } else { unset logscale y; set yrange [0:1.05] }
				col = C_GBPS
			} else {
				unset logscale y
				set ylabel "ratio to native"
				if (l eq "uncapped") { set yrange [0:*] } else { set yrange [0:1.2] }
				col = C_RATIO
			}
			plot for [i=1:words(configs)] summary using (sel(cfg(i), l, d, C_STREAMS)):(sel(cfg(i), l, d, col)) \
				with linespoints lw 2 pt 7 lc rgb word(colors, i) title cfg(i)
		}
	}
	unset multiplot
}
