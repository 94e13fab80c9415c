set terminal pngcairo size 1000,640 noenhanced
set datafile missing 'NaN'
set key outside right top
set grid
set output 'bench/out/throughput.png'
set title 'no-op children per second vs batch size (2 threads, Intel(R) Xeon(R) Processor)'
set logscale xy
set xlabel 'children per batch (1 and 8: 16 children in flight)'
set ylabel 'children / s'
set xtics (1, 8, 64, 512, 4096)
plot for [i=2:10] 'bench/out/throughput.dat' using 1:i with linespoints lw 2 title columnheader(i)
set output 'bench/out/submit.png'
set title 'submit call cost vs batch size: time until fanout_dispatch() / the peer''s submit returns'
set ylabel 'ns per call'
set xlabel 'children per batch'
plot for [i=2:8] 'bench/out/submit.dat' using 1:i with linespoints lw 2 title columnheader(i)
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
