# SPDX-License-Identifier: MIT
# bench/plot-scale.gp: the scale benchmark (TestScaleBench) of one user-mode
# gateway: join and handshake latency (p50, p99) and the gateway's resident
# memory against the number of jobs started (storm and ramp phases).
#   jq -r '.[] | select(.Phase=="storm" or .Phase=="ramp") | [.N, .Report.OK, .Report.join.P50, .Report.join.P99,
#          .Report.handshake.P50, .Report.handshake.P99, .GwRSSKiB/1024, .Load] | @tsv' DIR/results.json > DIR/scale.tsv
#   gnuplot -e "data='DIR/scale.tsv'; out='docs/benchmarks-scale.png'" bench/plot-scale.gp
set terminal pngcairo size 1400,550 font "Sans,11"
set output out
set datafile separator "\t"
set multiplot layout 1,2 title "one user-mode gateway, jobs from airlock-testpeer jobs (shared 2-core VM; load average in the labels)"
set grid
set key left top
set xlabel "jobs started (1,000 and 2,000: within 10 s; 4,000 and more: 50 per second)"
set ylabel "seconds"
set logscale y
plot data using 1:($3/1000) with linespoints title "join p50", \
     data using 1:($4/1000) with linespoints title "join p99", \
     data using 1:($6/1000) with linespoints title "handshake p99", \
     data using 1:($4/1000):(sprintf("load %.0f", $8)) with labels offset 0,1 notitle
unset logscale y
set ylabel "MiB / jobs"
set y2label "KiB per job"
set y2tics
plot data using 1:7 with linespoints title "gateway RSS, MiB", \
     data using 1:2 with linespoints title "jobs joined", \
     data using 1:($7*1024/$2) axes x1y2 with linespoints title "RSS per joined job, KiB (right)"
unset multiplot
