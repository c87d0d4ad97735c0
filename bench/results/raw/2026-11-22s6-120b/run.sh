#!/usr/bin/env bash
# One device run: build; llama3-8b NVFP4 start-to-first-token (page cache dropped, then warm);
# gpt-oss-120b MXFP4 gen + bench (+ start to first token).
H="$(cd "$(dirname "$0")" && pwd)"
cd "$H/tree"
O=$OUT/logs; mkdir -p $O
T0=$(date +%s)
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*" | tee -a $O/steps.txt; }
{ date -u; nproc; free -g; df -hT / /tmp /dev/shm /root /var/tmp "$PWD" 2>&1; cat /proc/meminfo | head -5; mount | grep -E ' / | /tmp | /dev/shm ' ; nvidia-smi; } > $O/machine.txt 2>&1
cat $O/machine.txt
el build
cmake -S . -B /tmp/b120 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH=$PWD/.deps/root/usr > $O/build.txt 2>&1 && timeout 300 cmake --build /tmp/b120 -j16 --target fp4serve >> $O/build.txt 2>&1 || { el "build failed"; tail -30 $O/build.txt; cd $OUT && tar -czf r.tgz logs; exit 1; }
F=$(find /tmp/b120 -name fp4serve -type f | head -1); el "binary $F"
# disk-backed folder for the cold start (page cache can be dropped there, not on tmpfs)
D=
for d in /root /var/tmp /tmp "$H"; do t=$(df --output=fstype "$d" 2>/dev/null | tail -1); if [ "$t" != tmpfs ] && [ -w "$d" ]; then D=$d; break; fi; done
el "disk folder $D ($(df --output=fstype,avail -h $D | tail -1))"
L=$D/fp4s-l3
el "gen llama3-8b nvfp4"; timeout 120 $F gen --preset llama3-8b --format nvfp4 $L 2>&1 | tail -1 | tee -a $O/gen.txt
sync
for i in 1 2; do
  if echo 3 > /proc/sys/vm/drop_caches; then c=cold; else c="warm (drop_caches refused)"; fi
  el "ttft llama3-8b #$i page cache $c"; echo "page cache $c" >> $O/ttft.txt
  timeout 90 python3 "$H/ttft.py" $O/ttft-stderr.txt $F run -m $L -p Hello -n 1 --temperature 0 -v 2>&1 | tee -a $O/ttft.txt
done
for i in 1 2 3; do
  el "ttft llama3-8b warm #$i"; echo "page cache warm" >> $O/ttft.txt
  timeout 90 python3 "$H/ttft.py" $O/ttft-stderr.txt $F run -m $L -p Hello -n 1 --temperature 0 -v 2>&1 | tee -a $O/ttft.txt
done
rm -rf $L
# gpt-oss-120b: 65.25 GB; tmpfs where it has room (no disk traffic), else a tmpfs of our own, else disk
need=66000000000
room() { echo $(( $(df --output=avail -B1 "$1" 2>/dev/null | tail -1) + 0 )); }
G=
if [ "$(room /dev/shm)" -ge $need ]; then G=/dev/shm/oss120
elif mkdir -p /mnt/f4 && mount -t tmpfs -o size=80g tmpfs /mnt/f4 && [ "$(room /mnt/f4)" -ge $need ]; then G=/mnt/f4/oss120
elif [ "$(room $D)" -ge $need ]; then G=$D/oss120
fi
el "120b folder: ${G:-none} (shm $(room /dev/shm), disk $(room $D))"; df -hT /dev/shm /mnt/f4 $D >> $O/steps.txt 2>&1
[ -n "$G" ] || G=/dev/shm/oss120
el "gen gpt-oss-120b"; timeout 330 $F gen --preset gpt-oss-120b --format mxfp4 $G 2>&1 | tail -2 | tee -a $O/gen.txt
free -m >> $O/steps.txt; du -sh $G >> $O/steps.txt 2>&1
nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv,noheader -lms 250 > $O/smi.txt 2>&1 &
SMI=$!
el "bench 120b p512 n128"; timeout 200 $F bench -m $G -p 512 -n 128 --reps 3 2>&1 | tee $O/bench-120b.txt | tail -9
el "bench 120b ctx4096"; timeout 200 $F bench -m $G -p 0 --ctx 4096 -n 64 --reps 2 2>&1 | tee $O/bench-120b-ctx4096.txt | tail -8
free -m >> $O/steps.txt
el "ttft 120b (tmpfs: warm)"; echo "gpt-oss-120b, files on $G" >> $O/ttft.txt
timeout 120 python3 "$H/ttft.py" $O/ttft-stderr.txt $F run -m $G -p Hello -n 1 --temperature 0 -v 2>&1 | tee -a $O/ttft.txt
kill $SMI
el "peak GPU memory used: $(cut -d, -f2 $O/smi.txt | sort -n | tail -1)"
el done
cat $O/ttft.txt
cd $OUT && tar -czf r.tgz logs && rm -rf logs
