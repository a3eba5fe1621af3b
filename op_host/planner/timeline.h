// A timeline of one AI core's engines: tasks issued in program order on each engine
// (an engine runs its tasks in order, one at a time, as an Ascend pipe does), a task
// starting when its engine is free and every task it depends on has finished (plus
// the dependency's latency, e.g. a cross-core flag, and its engine's arrival: a transfer's
// data is usable a while after the transfer leaves its engine). The schedule model
// builds the task graph of a kernel's rounds; this runs it.
#ifndef FLASH_CANN_PLANNER_TIMELINE_H
#define FLASH_CANN_PLANNER_TIMELINE_H

#include <array>
#include <cstdint>
#include <vector>

namespace flash_cann {

// The engines of one AI core: the cube core's MTE2/MTE1/M/FIX pipes and one vector
// core's MTE2/V/MTE3 pipes (the two vector cores run the same program on their rows).
enum class Engine : uint32_t {
    kCubeMte2, kCubeMte1, kCube, kFixpipe, kVecMte2, kVector, kVecMte3, kCount
};
constexpr uint32_t kEngines = static_cast<uint32_t>(Engine::kCount);
const char* EngineName(Engine engine);

using EngineSeconds = std::array<double, kEngines>;

class Timeline {
public:
    using TaskId = int32_t;
    static constexpr TaskId kNone = -1;

    // `arrival`: per engine, the seconds a dependent task on another engine waits after
    // a task of that engine ends (ArrivalOf: a rate table's transfer arrivals).
    explicit Timeline(const EngineSeconds& arrival = {}) : arrival_(arrival) {}

    // A task of `seconds` on `engine`, after the engine's previous task.
    TaskId Add(Engine engine, double seconds);
    // `task` starts no earlier than `latency` seconds after `dependency` ends (kNone: no-op).
    void After(TaskId task, TaskId dependency, double latency = 0);
    // Schedules every task; returns the time the last one ends, or a negative value if
    // the graph deadlocks (a dependency on a later task of the same engine).
    double Run();
    // Seconds each engine was busy (valid after Run).
    const EngineSeconds& Busy() const { return busy_; }

private:
    struct Dependency {
        TaskId task;
        double latency;
    };
    struct Task {
        Engine engine;
        double seconds;
        std::vector<Dependency> dependencies;
        double end = -1;
    };
    std::vector<Task> tasks_;
    EngineSeconds arrival_;
    EngineSeconds busy_{};
};

}  // namespace flash_cann

#endif
