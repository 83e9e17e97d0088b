# SPDX-License-Identifier: MIT
# bench/plot-wan.gp: runs through the impairment relay. Ratio to the
# interleaved native run against loss, one panel per RTT (columns) and
# direction (rows), one line per configuration, solid for one stream and
# dashed for the largest stream count measured. Called by run.sh when
# summary-wan.tsv exists:
#   gnuplot -e "summary='DIR/summary-wan.tsv'; outdir='DIR'; streams_hi=10" bench/plot-wan.gp
# Writes DIR/benchmarks-wan.png.

set datafile separator "\t"
set datafile missing NaN
set terminal pngcairo size 1400,900 font "Sans,11"
set output outdir."/benchmarks-wan.png"
set key outside right top font ",10"
set grid
set xlabel "random loss per direction (%)"
set xtics ("0" 0, "0.1" 1, "1" 2)
set xrange [-0.2:2.2]
set ylabel "ratio to native"
set yrange [0:1.3]
if (!exists("streams_hi")) streams_hi = 10

configs = "airlock airlock-netstack airlock-kernel airlock-tcp ocserv ocserv-dtls"
colors = "#d62728 #e377c2 #ff7f0e #8c564b #1f77b4 #17becf"
cfg(i) = word(configs, i)

C_CONFIG = 1; C_RTT = 2; C_LOSS = 3; C_DIR = 4; C_STREAMS = 5; C_RATIO = 8
xpos(l) = (l == 0 ? 0 : (l < 0.5 ? 1 : 2))
sel(c, r, d, s) = (strcol(C_CONFIG) eq c && column(C_RTT) == r && strcol(C_DIR) eq d && column(C_STREAMS) == s) ? column(C_RATIO) : NaN

set multiplot layout 2,2 title "through the impairment relay, 1 Gbit links: throughput / interleaved native (solid: 1 stream, dashed: ".streams_hi." streams)" font ",13"
do for [d in "up down"] {
	do for [r in "10 40"] {
		set title sprintf("RTT %s ms, %s", r, (d eq "up" ? "job → outside" : "outside → job (-R)"))
		plot for [i=1:words(configs)] summary using (xpos(column(C_LOSS))):(sel(cfg(i), r+0, d, 1)) \
			with linespoints lw 2 pt 7 lc rgb word(colors, i) title cfg(i), \
		     for [i=1:words(configs)] summary using (xpos(column(C_LOSS))):(sel(cfg(i), r+0, d, streams_hi)) \
			with linespoints lw 2 dt 2 pt 6 lc rgb word(colors, i) notitle
	}
}
unset multiplot
