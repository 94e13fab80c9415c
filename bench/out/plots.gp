set terminal pngcairo size 1000,640 noenhanced
set datafile missing 'NaN'
set key outside right top
set grid
set output 'bench/out/throughput.png'
set title 'no-op children per second vs batch size (2 threads, AMD EPYC)'
set logscale xy
set xlabel 'children per batch (1 and 8: 16 children in flight)'
set ylabel 'children / s'
set xtics (1, 8, 64, 512, 4096)
plot 'bench/out/throughput.dat' using 1:2:3:4 with yerrorlines lw 2 lc rgb '#d62728' title 'fanout', 'bench/out/throughput.dat' using 1:5:6:7 with yerrorlines lw 2 lc rgb '#ff7f0e' title 'fanout_help', 'bench/out/throughput.dat' using 1:8:9:10 with yerrorlines lw 2 lc rgb '#8c564b' title 'fanout_run', 'bench/out/throughput.dat' using 1:11:12:13 with yerrorlines lw 2 lc rgb '#7f7f7f' title 'mutexpool', 'bench/out/throughput.dat' using 1:14:15:16 with yerrorlines lw 2 lc rgb '#2ca02c' title 'libuv', 'bench/out/throughput.dat' using 1:17:18:19 with yerrorlines lw 2 lc rgb '#17becf' title 'glib', 'bench/out/throughput.dat' using 1:20:21:22 with yerrorlines lw 2 lc rgb '#9467bd' title 'openmp', 'bench/out/throughput.dat' using 1:23:24:25 with yerrorlines lw 2 lc rgb '#1f77b4' title 'onetbb', 'bench/out/throughput.dat' using 1:26:27:28 with yerrorlines lw 2 lc rgb '#bcbd22' title 'python-tpe', 'bench/out/throughput.dat' using 1:29:30:31 with yerrorlines lw 2 lc rgb '#e377c2' title 'fanout_noclock', 'bench/out/throughput.dat' using 1:32:33:34 with yerrorlines lw 2 lc rgb '#393b79' title 'fanout_ondemand'
set output 'bench/out/submit.png'
set title 'submit call cost vs batch size: time until fanout_dispatch() / the peer''s submit returns'
set ylabel 'ns per call'
set xlabel 'children per batch'
plot 'bench/out/submit.dat' using 1:2:3:4 with yerrorlines lw 2 lc rgb '#d62728' title 'fanout', 'bench/out/submit.dat' using 1:5:6:7 with yerrorlines lw 2 lc rgb '#ff7f0e' title 'fanout_help', 'bench/out/submit.dat' using 1:8:9:10 with yerrorlines lw 2 lc rgb '#7f7f7f' title 'mutexpool', 'bench/out/submit.dat' using 1:11:12:13 with yerrorlines lw 2 lc rgb '#2ca02c' title 'libuv', 'bench/out/submit.dat' using 1:14:15:16 with yerrorlines lw 2 lc rgb '#17becf' title 'glib', 'bench/out/submit.dat' using 1:17:18:19 with yerrorlines lw 2 lc rgb '#9467bd' title 'openmp', 'bench/out/submit.dat' using 1:20:21:22 with yerrorlines lw 2 lc rgb '#1f77b4' title 'onetbb', 'bench/out/submit.dat' using 1:23:24:25 with yerrorlines lw 2 lc rgb '#e377c2' title 'fanout_noclock', 'bench/out/submit.dat' using 1:26:27:28 with yerrorlines lw 2 lc rgb '#393b79' title 'fanout_ondemand'
reset
set terminal pngcairo size 1000,640 noenhanced
set output 'bench/out/latency.png'
set title 'single-child submit->join latency percentiles, closed loop (us, log scale)'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set logscale y
set grid ytics
set key outside right top
set ylabel 'microseconds'
set xtics rotate by -30
plot 'bench/out/latency.dat' using 2:xtic(1) title 'hot p50', '' using 3 title 'hot p99', '' using 4 title 'hot p999', '' using 5 title 'parked p50', '' using 6 title 'parked p99', '' using 7 title 'parked p999'
