#include "timeline.h"

#include <algorithm>

namespace flash_cann {

const char* EngineName(Engine engine)
{
    switch (engine) {
        case Engine::kCubeMte2: return "cube MTE2 (GM/L2 -> L1)";
        case Engine::kCubeMte1: return "cube MTE1 (L1 -> L0)";
        case Engine::kCube: return "cube (MMAD)";
        case Engine::kFixpipe: return "Fixpipe (L0C -> GM/L2)";
        case Engine::kVecMte2: return "vector MTE2 (GM/L2 -> UB)";
        case Engine::kVector: return "vector (V)";
        case Engine::kVecMte3: return "vector MTE3 (UB -> GM/L2)";
        case Engine::kCount: break;
    }
    return "?";
}

Timeline::TaskId Timeline::Add(Engine engine, double seconds)
{
    tasks_.push_back({engine, seconds, {}, -1});
    return static_cast<TaskId>(tasks_.size() - 1);
}

void Timeline::After(TaskId task, TaskId dependency, double latency)
{
    if (task != kNone && dependency != kNone) {
        tasks_[static_cast<size_t>(task)].dependencies.push_back({dependency, latency});
    }
}

double Timeline::Run()
{
    std::array<std::vector<TaskId>, kEngines> queues;
    for (size_t i = 0; i < tasks_.size(); ++i) {
        queues[static_cast<uint32_t>(tasks_[i].engine)].push_back(static_cast<TaskId>(i));
    }
    std::array<size_t, kEngines> next{};
    EngineSeconds free{};
    busy_ = {};
    size_t done = 0;
    double last = 0;
    while (done < tasks_.size()) {
        bool progress = false;
        for (uint32_t e = 0; e < kEngines; ++e) {
            while (next[e] < queues[e].size()) {
                Task& task = tasks_[static_cast<size_t>(queues[e][next[e]])];
                double start = free[e];
                bool ready = true;
                for (const Dependency& d : task.dependencies) {
                    const Task& before = tasks_[static_cast<size_t>(d.task)];
                    if (before.end < 0) {
                        ready = false;
                        break;
                    }
                    const double arrival = before.engine == task.engine ? 0 : arrival_[static_cast<uint32_t>(before.engine)];
                    start = std::max(start, before.end + d.latency + arrival);
                }
                if (!ready) {
                    break;
                }
                task.end = start + task.seconds;
                free[e] = task.end;
                busy_[e] += task.seconds;
                last = std::max(last, task.end);
                ++next[e];
                ++done;
                progress = true;
            }
        }
        if (!progress) {
            return -1;
        }
    }
    return last;
}

}  // namespace flash_cann
